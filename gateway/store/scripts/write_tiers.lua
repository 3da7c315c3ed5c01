-- WRITE_TIERS: a job's result, compare-and-set.
--
-- KEYS: meta, tiers, jobs, the jobs' order.  ARGV: 1 expected version, 2 tiers JSON,
-- 3 job id, 4 ttl_s.
-- Reply: 1 written, 0 someone wrote first, -1 the session is gone.
-- Writes only if nobody wrote since the job read the tiers (versions never go back), and
-- only if the session still exists: an erased session must not be resurrected by a job
-- that was in flight when it was erased.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  return -1
end
local current = redis.call('GET', KEYS[2])
local version = 0
if current then
  version = tonumber(cjson.decode(current)['version'])
end
if version ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'EX', tonumber(ARGV[4]))
redis.call('HDEL', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
return 1
