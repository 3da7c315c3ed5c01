-- FAIL_JOB: a failed attempt at a pending job: counted in the job's own record, with the
-- time it may be tried again; on its last attempt the job is dropped instead.
--
-- KEYS: jobs, the jobs' order.  ARGV: 1 job id, 2 attempts allowed, 3 now (s),
--   4 the first backoff (s), doubling with each attempt, 5 the longest backoff (s).
-- Reply: {attempts, retry_at (a string)}; attempts 0: the job is no longer pending
--   (another runner finished it); attempts >= allowed: it was dropped, from both keys.
-- In one script, so that a job finished meanwhile is never written back.
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return {0, '0'}
end
local job = cjson.decode(raw)
local attempts = (tonumber(job['attempts']) or 0) + 1
if attempts >= tonumber(ARGV[2]) then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {attempts, '0'}
end
local delay = math.min(tonumber(ARGV[4]) * 2 ^ (attempts - 1), tonumber(ARGV[5]))
local retry_at = tonumber(ARGV[3]) + delay
job['attempts'] = attempts
job['retry_at'] = retry_at
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(job))
return {attempts, string.format('%.3f', retry_at)}
