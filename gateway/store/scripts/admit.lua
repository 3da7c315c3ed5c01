-- ADMIT: a rate-limited request admitted or refused (``gateway.http.rate_limits``).
--
-- KEYS: per scope (the tenant, the key), five keys: requests in the previous and the
-- current minute, tokens in the previous and the current minute, the in-flight set.
-- ARGV: 1 the previous minute's weight, 2 now, 3 lease id, 4 lease expiry, 5 counters'
-- TTL, 6 the in-flight set's TTL; then per scope: requests a minute, tokens a minute, in
-- flight (0: no limit).
-- Reply: {-1} when admitted (the request counted, its lease taken), else {scope, limit (1
-- requests, 2 tokens, 3 in flight), previous count, current count}.
local weight, now = tonumber(ARGV[1]), tonumber(ARGV[2])
local scopes = #KEYS / 5
local function count(key)
  return tonumber(redis.call('GET', key) or '0')
end
for s = 0, scopes - 1 do
  local k, a = s * 5, 7 + s * 3
  local rpm, tpm, most = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if rpm > 0 then
    local prev, curr = count(KEYS[k + 1]), count(KEYS[k + 2])
    if prev * weight + curr + 1 > rpm then
      return {s, 1, prev, curr}
    end
  end
  if tpm > 0 then
    local prev, curr = count(KEYS[k + 3]), count(KEYS[k + 4])
    if prev * weight + curr + 1 > tpm then
      return {s, 2, prev, curr}
    end
  end
  if most > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[k + 5], '-inf', now)
    if redis.call('ZCARD', KEYS[k + 5]) >= most then
      return {s, 3, 0, 0}
    end
  end
end
for s = 0, scopes - 1 do
  local k, a = s * 5, 7 + s * 3
  if tonumber(ARGV[a]) > 0 then
    redis.call('INCR', KEYS[k + 2])
    redis.call('EXPIRE', KEYS[k + 2], ARGV[5])
  end
  if tonumber(ARGV[a + 2]) > 0 then
    redis.call('ZADD', KEYS[k + 5], ARGV[4], ARGV[3])
    redis.call('EXPIRE', KEYS[k + 5], ARGV[6])
  end
end
return {-1}
