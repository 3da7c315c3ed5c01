-- RELEASE: a session's job lease, released only if we still hold it.
--
-- KEYS: lease.  ARGV: 1 holder.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
