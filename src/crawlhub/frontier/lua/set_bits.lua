-- KEYS: meta   ARGV: segment plan admitted found
--   admitted, found: h1 h2 ('<I4I4') of each key admit stored ('1') or found stored
--   unknown to the filter ('2'); the bits of either may be set already (then skipped):
--   another process that found a key this one admitted may set them first, and counting
--   the key twice would grow the filter a layer before its capacity is reached
local set_args = {}
local function add(h1, h2)
  local layer = layers[#layers]
  if layer.count >= layer.cap then
    add_layer()
    layer = layers[#layers]
  end
  local args = set_args[#layers]
  if not args then
    args = {}
    for j = 0, layer.k - 1 do
      args[4 * j + 1] = 'SET'; args[4 * j + 2] = 'u1'; args[4 * j + 4] = '1'
    end
    set_args[#layers] = args
  end
  for j = 0, layer.k - 1 do args[4 * j + 3] = fmt('%d', (h1 + j * h2) % layer.bits) end
  redis.call('BITFIELD', layer.key, unpack(args))
  layer.count = layer.count + 1
end
for _, arg in ipairs({ARGV[3], ARGV[4]}) do
  for pos = 1, #arg, 8 do
    local h1, h2 = struct.unpack('<I4I4', arg, pos)
    if not present(h1, h2) then add(h1, h2) end
  end
end
local counts = {}
for i = 1, #layers do
  counts[#counts + 1] = 'count' .. i
  counts[#counts + 1] = layers[i].count
end
redis.call('HSET', meta, unpack(counts))
return #layers
