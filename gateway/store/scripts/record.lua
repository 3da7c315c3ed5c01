-- RECORD: append a turn to a session's log, atomically.
--
-- KEYS: the session's keys in ``SessionKeys.all()`` order: meta (1), log (2), tiers,
-- pins (4), jobs (5), lease (6), vec (7), ..., the jobs' order next to last
-- (KEYS[#KEYS - 1]) and branches LAST (KEYS[#KEYS]); every one but the lease gets the
-- retention TTL.
-- ARGV (built by ``codecs.RecordArgs.encode``, one place):
--   1 ttl_s, 2 now, 3 session id, 4 user id ("" = keep), 5 truncate_to (-1 = none),
--   6 expected count (-1 = any), 7 user messages appended, 8 M = messages appended,
--   9 predicted first index (-1 = none), 10 predicted turns before, 11 J = predicted
--   jobs, 12 P = predicted pins, 13 a new generation token, 14 the appended bytes,
--   15 the turn's record id; then M message JSONs, M vectors ("" = none), J (job id,
--   job JSON) pairs, P (pin id, pin JSON) pairs.
-- Reply (read by ``codecs.Recorded.decode``): {first, count, turns, new user (1/0),
--   predicted (1/0), generation, repeated (1/0)}; first = -1: the log had another length;
--   -2: the session is another user's (its user is set once, by its first user's turn).
--
-- A record is idempotent by its id: sent again because its reply was lost (Redis went
-- away after running it), it appends nothing and answers what it did (repeated = 1), so
-- a retry never stores a turn twice.
-- Appends after an optional truncation (a regenerate replacing the stored answer, an edit
-- abandoning what followed the edited message: either is kept in the branches list, the
-- last KEY) in one step, so concurrent turns never interleave and a reader never sees
-- half a turn.
-- A plan made against a given log length (an import, a retry, a regenerate) writes
-- nothing if another turn landed meanwhile: it returns first = -1 and the caller plans
-- again, rather than importing twice or deleting someone else's turn.
-- The predicted jobs and pins are written only when the append lands where the caller
-- predicted (the usual case: no concurrent turn on the session); otherwise the reply says
-- so and the caller computes them again from the real indexes.
-- The vectors list is aligned with the log's end (a log recorded before vectors existed
-- has fewer); a truncation takes the same number off both. It gives the log a new
-- generation (``memory.archive``), remembering the one before and how many messages it
-- kept, so a process holding the old one drops only what was replaced.
local n = redis.call('LLEN', KEYS[2])
if ARGV[15] ~= '' and redis.call('HGET', KEYS[1], 'rec') == ARGV[15] then
  -- This very turn again (its reply was lost): what it did, not a second append.
  local did = redis.call('HMGET', KEYS[1], 'rec_first', 'rec_pred', 'turns', 'gen')
  return {tonumber(did[1]), n, tonumber(did[3]), 0, tonumber(did[2]), did[4], 1}
end
local expected = tonumber(ARGV[6])
if expected >= 0 and n ~= expected then
  return {-1, n, 0, 0, 0, '', 0}
end
-- A session's user is set once: a turn naming another user appends nothing (first = -2),
-- checked here, with the write, so that two users racing a first turn cannot both land.
local owner = redis.call('HGET', KEYS[1], 'user_id')
if ARGV[4] ~= '' and owner and owner ~= ARGV[4] then
  return {-2, n, 0, 0, 0, '', 0}
end
local gen = redis.call('HGET', KEYS[1], 'gen')
local truncate_to = tonumber(ARGV[5])
if truncate_to >= 0 and n > truncate_to then
  -- What the truncation takes off is kept, marked, in the branches list (the last KEY):
  -- an edit's abandoned messages, or a regenerate's replaced answer. Abandoned user
  -- messages are no longer turns of the conversation.
  local gone, users = redis.call('LRANGE', KEYS[2], truncate_to, -1), 0
  for _, raw in ipairs(gone) do
    if cjson.decode(raw)['role'] == 'user' then users = users + 1 end
  end
  local kind = users > 0 and 'edit' or 'regenerate'
  redis.call('RPUSH', KEYS[#KEYS], '{"from":' .. truncate_to .. ',"at":' .. ARGV[2]
    .. ',"kind":"' .. kind .. '","messages":[' .. table.concat(gone, ',') .. ']}')
  if users > 0 then
    redis.call('HINCRBY', KEYS[1], 'turns', -users)
  end
end
if truncate_to >= 0 and n > truncate_to then
  local vectors = redis.call('LLEN', KEYS[7])
  while n > truncate_to do
    redis.call('RPOP', KEYS[2])
    n = n - 1
    if vectors > 0 then
      redis.call('RPOP', KEYS[7])
      vectors = vectors - 1
    end
  end
  redis.call('HSET', KEYS[1], 'prev', gen or '', 'kept', n, 'gen', ARGV[13])
  gen = ARGV[13]
elseif not gen then
  redis.call('HSET', KEYS[1], 'gen', ARGV[13])
  gen = ARGV[13]
end
local first = n + 1
local m, jobs, pins = tonumber(ARGV[8]), tonumber(ARGV[11]), tonumber(ARGV[12])
local predicted = 0
if first == tonumber(ARGV[9])
    and tonumber(redis.call('HGET', KEYS[1], 'turns') or 0) == tonumber(ARGV[10]) then
  predicted = 1
end
if m > 0 then
  n = redis.call('RPUSH', KEYS[2], unpack(ARGV, 16, 15 + m))
  redis.call('RPUSH', KEYS[7], unpack(ARGV, 16 + m, 15 + 2 * m))
  redis.call('HINCRBY', KEYS[1], 'bytes', tonumber(ARGV[14]))
end
redis.call('HSET', KEYS[1], 'rec', ARGV[15], 'rec_first', first, 'rec_pred', predicted)
local at = 16 + 2 * m
if predicted == 1 then
  for i = at, at + 2 * jobs - 1, 2 do
    redis.call('HSET', KEYS[5], ARGV[i], ARGV[i + 1])
    -- In the jobs' order too, by trigger: the worker reads its head, not every job.
    redis.call('ZADD', KEYS[#KEYS - 1], cjson.decode(ARGV[i + 1])['trigger'], ARGV[i])
  end
  for i = at + 2 * jobs, at + 2 * (jobs + pins) - 1, 2 do
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  end
end
local new_user = 0
if ARGV[4] ~= '' and not owner then
  redis.call('HSET', KEYS[1], 'user_id', ARGV[4])
  new_user = 1
end
redis.call('HSET', KEYS[1], 'sid', ARGV[3], 'updated', ARGV[2])
redis.call('HSETNX', KEYS[1], 'created', ARGV[2])
redis.call('HDEL', KEYS[1], 'ended')
local turns = redis.call('HINCRBY', KEYS[1], 'turns', tonumber(ARGV[7]))
local ttl = tonumber(ARGV[1])
for i = 1, #KEYS do
  -- The lease keeps the short PX its runner took it with: given the retention, a runner
  -- that died holding it would block the session's jobs for days.
  if i ~= 6 then
    redis.call('EXPIRE', KEYS[i], ttl)
  end
end
return {first, n, turns, new_user, predicted, gen, 0}
