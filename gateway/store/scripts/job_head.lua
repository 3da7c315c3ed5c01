-- JOB_HEAD: what a notice's runner reads of its session's pending jobs, whatever their
-- number: the notice's own job and the two oldest (the order's head; the session's end,
-- trigger 0, may be the first of them).
--
-- KEYS: jobs, the jobs' order.  ARGV: 1 the notice's job id, 2 ttl_s.
-- Reply: {own job JSON (nil: no longer pending), {id, job JSON, ...} oldest first,
--   pending jobs}.
-- The order is made again from the jobs hash when the two disagree (jobs written by a
-- gateway that kept no order, or an id left behind): that once costs O(pending); every
-- other call, O(1) in the session's pending jobs.
local function rebuild()
  redis.call('DEL', KEYS[2])
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    redis.call('ZADD', KEYS[2], cjson.decode(all[i + 1])['trigger'], all[i])
  end
  if #all > 0 then
    redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
  end
end

local function head()
  local found = {}
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, 1)) do
    local raw = redis.call('HGET', KEYS[1], id)
    if not raw then
      return nil
    end
    table.insert(found, id)
    table.insert(found, raw)
  end
  return found
end

local pending = redis.call('HLEN', KEYS[1])
if redis.call('ZCARD', KEYS[2]) ~= pending then
  rebuild()
end
local oldest = head()
if not oldest then
  rebuild()
  oldest = head()
end
return {redis.call('HGET', KEYS[1], ARGV[1]), oldest, pending}
