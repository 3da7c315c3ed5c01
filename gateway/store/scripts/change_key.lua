-- CHANGE_KEY: create, replace or revoke a gateway key (``store.gateway_keys``).
--
-- KEYS: keys, version.  ARGV: 1 key id, 2 record JSON ("" to revoke), 3 a new epoch.
-- Changes the keys and moves the version in one step, so a process that sees the new
-- version reads the change. The version is "<epoch>:<n>": the epoch is made with the
-- first change after the version went missing (Redis lost its data), so a version never
-- repeats across a loss, and a process that read the keys before it reads them again
-- (a counter alone restarted at 1: a process cut off across the loss kept its old keys).
local changed
if ARGV[2] == '' then
  changed = redis.call('HDEL', KEYS[1], ARGV[1])
else
  changed = redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  changed = 1
end
if changed == 1 then
  local version = redis.call('GET', KEYS[2])
  local epoch, n = ARGV[3], 0
  if version then
    local at = string.find(version, ':', 1, true)
    if at then
      epoch = string.sub(version, 1, at - 1)
      n = tonumber(string.sub(version, at + 1)) or 0
    else
      n = tonumber(version) or 0  -- a version written before epochs: kept, given one
    end
  end
  redis.call('SET', KEYS[2], epoch .. ':' .. (n + 1))
end
return changed
