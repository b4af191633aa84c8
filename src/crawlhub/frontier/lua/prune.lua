-- KEYS: segments   ARGV: stem before
local segments, stem, before = KEYS[1], ARGV[1], tonumber(ARGV[2])
local gone = {}
for _, seg in ipairs(redis.call('ZRANGEBYSCORE', segments, '-inf', '(' .. before)) do
  local st = stem .. seg
  local owed = tonumber(redis.call('HGET', st .. ':stats', 'pending') or '0')
             + tonumber(redis.call('HGET', st .. ':stats', 'leased') or '0')
  if owed == 0 then
    local layers = tonumber(redis.call('HGET', st .. ':bloom', 'layers') or '0')
    for i = 1, layers do redis.call('DEL', st .. ':bloom:' .. i) end
    redis.call('DEL', st .. ':seeds', st .. ':attempts', st .. ':stats', st .. ':bloom')
    redis.call('ZREM', segments, seg)
    gone[#gone + 1] = seg
  end
end
return gone
