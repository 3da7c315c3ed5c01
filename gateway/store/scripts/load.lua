-- LOAD: a session as one request needs it, read atomically.
--
-- KEYS: meta, log, tiers, pins, jobs, vec.
-- ARGV (``codecs.LoadArgs.encode``): 1 tail, 2 the generation the caller holds ("" =
-- none), 3 how many messages it holds, 4 most (the longest delta read), 5 vectors (1/0).
-- Reply (``codecs.LoadReply.decode``): {meta (HGETALL), count, start, warm, messages,
-- vector offset, vectors, tiers, pins, pending jobs}.
--
-- Its meta and length, its tiers, pins and pending jobs (when tail > 0), and messages
-- from ``start`` on with their vectors. Where the caller holds the log under this
-- generation (or under the one before, up to what that kept), ``start`` is where what it
-- holds ends and ``warm`` is 1: usually the previous turn's messages, or none. Otherwise
-- ``start`` leaves the newest ``tail`` (the caller reads older ones by pages if it needs
-- them: archive_page.lua).
--#include slice.lua
local tail, held, most = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
local meta = redis.call('HGETALL', KEYS[1])
local n = redis.call('LLEN', KEYS[2])
local gen = redis.call('HGET', KEYS[1], 'gen')
local start, warm = math.max(n - tail, 0), 0
if ARGV[2] ~= '' and gen then
  if gen == ARGV[2] then
    if held <= n and n - held <= most then
      start, warm = held, 1
    end
  elseif redis.call('HGET', KEYS[1], 'prev') == ARGV[2] then
    local kept = tonumber(redis.call('HGET', KEYS[1], 'kept'))
    if kept <= held and n - kept <= most then
      start, warm = kept, 1
    end
  end
end
local messages, offset, vectors = slice(KEYS[2], KEYS[6], n, start, n - 1, ARGV[5] == '1')
local tiers, pins, pending = false, {}, 0
if tail > 0 then
  tiers = redis.call('GET', KEYS[3])
  pins = redis.call('HVALS', KEYS[4])
  pending = redis.call('HLEN', KEYS[5])
end
return {meta, n, start, warm, messages, offset, vectors, tiers, pins, pending}
