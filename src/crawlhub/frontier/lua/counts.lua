-- KEYS: ready due leased segments   ARGV: stem now_ms
local ready, due, leased, segments, stem = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
sweep(stem, ready, due, leased, tonumber(ARGV[2]))
local out = {}
for _, seg in ipairs(redis.call('ZRANGE', segments, 0, -1)) do
  out[#out + 1] = seg
  out[#out + 1] = redis.call('HGETALL', stem .. seg .. ':stats')
end
return out
