-- LIMIT_RESERVE: a request's prompt tokens reserved against its scopes' token limits
-- before it is forwarded, or refused (``gateway.http.rate_limits``; settled when it is
-- over, by ``store.limits.release``).
--
-- KEYS: per scope, two keys: tokens in the previous and the current minute.
-- ARGV: 1 the previous minute's weight, 2 the tokens to reserve, 3 the counters' TTL;
-- then per scope: tokens a minute.
-- Reply: {-1} when reserved (added to each scope's current minute), else {scope, 2,
-- previous count, current count}.
--
-- A reservation larger than a scope's whole limit needs only that the scope's minute is
-- empty: a prompt larger than the budget is still served, alone.
local weight, amount = tonumber(ARGV[1]), tonumber(ARGV[2])
local scopes = #KEYS / 2
local function count(key)
  return tonumber(redis.call('GET', key) or '0')
end
for s = 0, scopes - 1 do
  local tpm = tonumber(ARGV[4 + s])
  local prev, curr = count(KEYS[s * 2 + 1]), count(KEYS[s * 2 + 2])
  if prev * weight + curr + math.min(amount, tpm) > tpm then
    return {s, 2, prev, curr}
  end
end
for s = 0, scopes - 1 do
  redis.call('INCRBY', KEYS[s * 2 + 2], amount)
  redis.call('EXPIRE', KEYS[s * 2 + 2], ARGV[3])
end
return {-1}
