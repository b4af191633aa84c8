-- Record entries (KEYS: ledger, deadlines, retention, counters; ARGV: uuids joined, their
-- lengths, entries joined, their lengths, deadlines ("" = none), retention expiry, then
-- counter field / increment pairs). Packed into a
-- few arguments: encoding hundreds of small arguments is what costs the client most.
local function split(blob, lengths)
  local out, pos = {}, 1
  for len in string.gmatch(lengths, '[^,]+') do
    local n = tonumber(len)
    table.insert(out, string.sub(blob, pos, pos + n - 1))
    pos = pos + n
  end
  return out
end
local ids = split(ARGV[1], ARGV[2])
local entries = split(ARGV[3], ARGV[4])
local deadlines = {}
for d in string.gmatch(ARGV[5], '([^,]*),?') do table.insert(deadlines, d) end
-- Bulk commands, a few hundred fields at a time (unpack has a stack limit).
local h, z, r = {}, {}, {}
for i, id in ipairs(ids) do
  h[#h + 1] = id; h[#h + 1] = entries[i]
  if deadlines[i] ~= nil and deadlines[i] ~= '' then
    z[#z + 1] = deadlines[i]; z[#z + 1] = id
  end
  r[#r + 1] = ARGV[6]; r[#r + 1] = id
  if #h >= 512 or i == #ids then
    redis.call('HSET', KEYS[1], unpack(h))
    if #z > 0 then redis.call('ZADD', KEYS[2], unpack(z)) end
    redis.call('ZADD', KEYS[3], unpack(r))
    h, z, r = {}, {}, {}
  end
end
for i = 7, #ARGV, 2 do redis.call('HINCRBY', KEYS[4], ARGV[i], ARGV[i + 1]) end
return #ids
