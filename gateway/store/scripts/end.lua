-- END: mark a session ended.
--
-- KEYS: meta.  ARGV: 1 now.  Reply: 1 marked, 0 the session no longer exists.
-- Only if it still exists: an end that was in flight when the session was erased must
-- not leave its meta hash behind.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'ended', ARGV[1])
return 1
