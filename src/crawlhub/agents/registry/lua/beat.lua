-- Heartbeats (KEYS: info, beat, seen; ARGV: agent id / heartbeat / stamp triples): a
-- registered agent's beat is stored unless a later one is, and its last sign of life
-- moves to the stamp, never backwards (ZADD GT); an unknown agent gets 0.
local out = {}
for i = 1, #ARGV, 3 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    local seen = redis.call('ZSCORE', KEYS[3], ARGV[i])
    if not seen or tonumber(ARGV[i + 2]) >= tonumber(seen) then
      redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
      redis.call('ZADD', KEYS[3], ARGV[i + 2], ARGV[i])
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
