-- ARCHIVE_PAGE: older messages of a log, with the generation they belong to (a
-- process filling its archive checks it did not change between pages).
--
-- KEYS: meta, log, vec.  ARGV (``codecs.ArchivePage.encode``): 1 start, 2 stop (0-based,
-- inclusive), 3 vectors (1/0).  Reply: {generation, count, messages, vector offset,
-- vectors}.
--#include slice.lua
local n = redis.call('LLEN', KEYS[2])
local start, stop = tonumber(ARGV[1]), math.min(tonumber(ARGV[2]), n - 1)
local messages, offset, vectors = slice(KEYS[2], KEYS[3], n, start, stop, ARGV[3] == '1')
return {redis.call('HGET', KEYS[1], 'gen') or '', n, messages, offset, vectors}
