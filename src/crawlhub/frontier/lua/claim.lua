-- KEYS: ready due leased   ARGV: stem now_ms lease_until_ms n
local ready, due, leased = KEYS[1], KEYS[2], KEYS[3]
local stem, now, until_ms, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
sweep(stem, ready, due, leased, now)
local out = {}
if n <= 0 then return out end
local popped = redis.call('ZPOPMIN', ready, n)
for i = 1, #popped, 2 do
  local m = popped[i]
  local sq, _, seg, key = parse(m)
  local v = redis.call('HGET', stem .. seg .. ':seeds', key)
  if v then  -- (a member without its seed record cannot be dispatched; it is dropped)
    redis.call('ZADD', leased, until_ms, m)
    local attempts = redis.call('HINCRBY', stem .. seg .. ':attempts', key, 1)
    count(stem, seg, 'pending', -1)
    count(stem, seg, 'leased', 1)
    out[#out + 1] = seg
    out[#out + 1] = key
    out[#out + 1] = attempts
    out[#out + 1] = string.match(v, '^%d+|%-?%d+|(.*)$')
    out[#out + 1] = sq
  end
end
return out
