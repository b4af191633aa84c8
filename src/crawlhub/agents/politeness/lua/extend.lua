-- Extend held slots (KEYS: the per-domain key stem; ARGV: now, then domain / slot / new
-- expiry triples); a slot expired at now is not brought back. Returns how many moved.
local now, n = tonumber(ARGV[1]), 0
for i = 2, #ARGV, 3 do
  local key = KEYS[1] .. ARGV[i] .. ':slots'
  local score = redis.call('ZSCORE', key, ARGV[i + 1])
  if score and tonumber(score) > now then
    redis.call('ZADD', key, 'XX', ARGV[i + 2], ARGV[i + 1])
    redis.call('EXPIRE', key, math.ceil(tonumber(ARGV[i + 2]) - now) + 60)
    n = n + 1
  end
end
return n
