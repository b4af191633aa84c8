-- KEYS: ready leased   ARGV: stem channel (seg key)*
local ready, leased, stem, channel = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local released = 0
for i = 3, #ARGV, 2 do
  local seg, key = ARGV[i], ARGV[i + 1]
  local m, prio = member_of(stem, seg, key)
  if m and redis.call('ZREM', leased, m) == 1 then
    redis.call('ZADD', ready, -prio, m)
    if redis.call('HINCRBY', stem .. seg .. ':attempts', key, -1) < 0 then
      redis.call('HSET', stem .. seg .. ':attempts', key, 0)
    end
    count(stem, seg, 'leased', -1)
    count(stem, seg, 'pending', 1)
    released = released + 1
  end
end
if released > 0 then redis.call('PUBLISH', channel, '1') end
return released
