-- RELEASE_USAGE: an erased session's bytes given back to its tenant's quota.
--
-- KEYS: a tenant's usage.  ARGV: 1 bytes erased.  A tenant whose last bytes go has no
-- count.
if redis.call('DECRBY', KEYS[1], ARGV[1]) <= 0 then
  redis.call('DEL', KEYS[1])
end
return 1
