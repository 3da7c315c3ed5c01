-- QUOTA_SETTLE: a write's bytes charged to its tenant's quota against what was held for it.
--
-- KEYS: the tenant's usage, its held set.
-- ARGV: 1 the bytes written (0: the hold given back unused), 2 the bytes held, 3 the
-- turn's hold ("" = bytes charged for good by the caller: an import's), 4 ttl_s.
-- Reply: what to take back (``release_usage.lua``) should the write turn out to have
-- appended nothing: a turn's hold is gone once settled, so all it wrote; an import's
-- bytes charged for good stay, the caller's to give back.
--
-- A hold no longer in the set (expired and given back, or settled by an earlier attempt
-- at the same record) holds nothing: the whole write is charged.
local written, change = tonumber(ARGV[1]), tonumber(ARGV[1])
if ARGV[3] == '' or redis.call('ZSCORE', KEYS[2], ARGV[3]) then
  change = change - tonumber(ARGV[2])
end
-- The first write, so that a full Redis (noeviction) refuses the script whole, as it
-- refuses the record in the same round trip.
local count = redis.call('INCRBY', KEYS[1], change)
if ARGV[3] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[3])
end
if count <= 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('EXPIRE', KEYS[1], ARGV[4])
end
if ARGV[3] == '' then
  return change
end
return written
