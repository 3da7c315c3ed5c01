-- A slice of the log with its vectors, aligned: included by load.lua and
-- archive_page.lua (see ``gateway/store/scripts.py``). ``start`` is a 0-based position;
-- the slice runs to ``stop``. Returns the messages, the offset of the first vector
-- (negative: that many messages have no vector) and the vectors.
local function slice(log, vec, n, start, stop, with_vectors)
  local messages, vectors, offset = {}, {}, 0
  if start <= stop then
    messages = redis.call('LRANGE', log, start, stop)
    if with_vectors then
      -- The vectors list covers the log's last LLEN entries: the position of its first.
      local first = n - redis.call('LLEN', vec)
      offset = start - first  -- negative: that many messages have no vector
      if stop >= first then
        vectors = redis.call('LRANGE', vec, math.max(offset, 0), stop - first)
      end
    end
  end
  return messages, offset, vectors
end
