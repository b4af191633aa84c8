-- KEYS: ready due leased   ARGV: stem channel now_ms archive (seg key outcome ready_ms)*
--   archive '0': a seed finished ok or failed loses its record and attempts (the filter
--   alone remembers its key). Returns one flag per seed: '1' changed, '0' it was not
--   pending or leased (already finished, or unknown).
local ready, due, leased = KEYS[1], KEYS[2], KEYS[3]
local stem, channel, now, archive = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local out, signal, counts = {}, false, {}
local function tally(seg, field, n)  -- one HINCRBY per segment and field at the end
  local k = seg .. '|' .. field
  counts[k] = (counts[k] or 0) + n
end
for i = 5, #ARGV, 4 do
  local seg, key, outcome, ready_ms = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  local m, prio = member_of(stem, seg, key)
  local was
  if m then
    if redis.call('ZREM', leased, m) == 1 then
      was = 'leased'
    elseif redis.call('ZREM', ready, m) == 1 or redis.call('ZREM', due, m) == 1 then
      was = 'pending'
    end
  end
  if was then
    tally(seg, was, -1)
    if outcome == 'ok' or outcome == 'failed' then
      tally(seg, outcome == 'ok' and 'done' or 'failed', 1)
      if archive == '0' then
        redis.call('HDEL', stem .. seg .. ':seeds', key)
        redis.call('HDEL', stem .. seg .. ':attempts', key)
      end
    else
      tally(seg, 'pending', 1)
      if ready_ms <= now then
        redis.call('ZADD', ready, -prio, m)
        signal = true
      else
        redis.call('ZADD', due, ready_ms, m)
      end
    end
    out[#out + 1] = '1'
  else
    out[#out + 1] = '0'
  end
end
for k, n in pairs(counts) do
  local seg, field = string.match(k, '^(.-)|(.*)$')
  if n ~= 0 then count(stem, seg, field, n) end
end
if signal then redis.call('PUBLISH', channel, '1') end
return table.concat(out)
