-- SAVE_VECTORS: an embeddings job's vectors.
--
-- KEYS: meta, vectors.  ARGV: 1 ttl_s, then (index, vector) pairs.  Reply: 1 / 0.
-- An embeddings job still running when its session was erased must not write the
-- session's vectors back.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[1]))
return 1
