-- KEYS: leased   ARGV: stem lease_until_ms (seg key)*
local leased, stem, until_ms = KEYS[1], ARGV[1], tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 2 do
  local m = member_of(stem, ARGV[i], ARGV[i + 1])
  if m and redis.call('ZSCORE', leased, m) then
    redis.call('ZADD', leased, until_ms, m)
    out[#out + 1] = '1'
  else
    out[#out + 1] = '0'
  end
end
return table.concat(out)
