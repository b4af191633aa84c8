-- ARGV: now, visibility timeout ms, refs
local deadline = now_ms(ARGV[1]) + tonumber(ARGV[2])
local k = 0
for id, want in refs(ARGV[3]) do
  if holds(id, want) then
    redis.call('ZADD', leased, deadline, id)
    k = k + 1
  end
end
return k
