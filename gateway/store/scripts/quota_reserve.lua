-- QUOTA_RESERVE: bytes charged to a tenant's quota before they are written, only if they fit.
--
-- KEYS: the tenant's usage (its stored bytes and those held), its held set.
-- ARGV: 1 bytes, 2 quota, 3 ttl_s, 4 now, 5 a turn's hold ("<id>:<bytes>"; "" = charged
-- for good: an import's, a pin's), 6 the hold's expiry.
-- Reply: {1, the count after} granted; {0, the count} refused, with nothing written, so
-- that a full Redis (noeviction) still refuses a tenant at its quota.
--
-- Holds past their expiry are given back first: a turn that never recorded (an upstream
-- error, a client gone) holds its bytes no longer than its lease.
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[4])
for _, hold in ipairs(expired) do
  used = used - tonumber(string.match(hold, ':(%d+)$'))
end
used = math.max(used, 0)
local n = tonumber(ARGV[1])
if used + n > tonumber(ARGV[2]) then
  return {0, used}
end
-- The first write: a full Redis refuses the script here, before anything is written.
redis.call('SET', KEYS[1], used + n, 'EX', ARGV[3])
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[4])
end
if ARGV[5] ~= '' then
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[5])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
return {1, used + n}
