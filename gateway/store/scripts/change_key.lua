-- CHANGE_KEY: create, replace or revoke a gateway key (``store.gateway_keys``).
--
-- KEYS: keys, version.  ARGV: 1 key id, 2 record JSON ("" to revoke).  Changes the keys
-- and moves the version in one step, so a process that sees the new version reads the
-- change.
local changed
if ARGV[2] == '' then
  changed = redis.call('HDEL', KEYS[1], ARGV[1])
else
  changed = redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  changed = 1
end
if changed == 1 then
  redis.call('INCR', KEYS[2])
end
return changed
