-- KEYS: ready due leased   ARGV: stem channel seg key outcome now_ms ready_ms archive
--   archive '0': a seed finished ok or failed loses its record and attempts (the filter
--   alone remembers its key)
local ready, due, leased = KEYS[1], KEYS[2], KEYS[3]
local stem, channel, seg, key, outcome = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now, ready_ms = tonumber(ARGV[6]), tonumber(ARGV[7])
local m, prio = member_of(stem, seg, key)
if not m then return 0 end
local was
if redis.call('ZREM', leased, m) == 1 then
  was = 'leased'
elseif redis.call('ZREM', ready, m) == 1 or redis.call('ZREM', due, m) == 1 then
  was = 'pending'
else
  return 0
end
count(stem, seg, was, -1)
if outcome == 'ok' or outcome == 'failed' then
  count(stem, seg, outcome == 'ok' and 'done' or 'failed', 1)
  if ARGV[8] == '0' then
    redis.call('HDEL', stem .. seg .. ':seeds', key)
    redis.call('HDEL', stem .. seg .. ':attempts', key)
  end
else
  count(stem, seg, 'pending', 1)
  if ready_ms <= now then
    redis.call('ZADD', ready, -prio, m)
    redis.call('PUBLISH', channel, '1')
  else
    redis.call('ZADD', due, ready_ms, m)
  end
end
return 1
