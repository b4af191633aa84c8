-- The bloom filter of one segment, for the admit and set_bits scripts.
-- KEYS[1]: the filter's meta hash   ARGV[1]: segment   ARGV[2]: plan, 'capacity,bits,k;...'
-- for each layer the filter may grow to.
local meta, seg = KEYS[1], ARGV[1]
local plan = {}
for cap, bits, k in string.gmatch(ARGV[2], '(%d+),(%d+),(%d+)') do
  plan[#plan + 1] = {tonumber(cap), tonumber(bits), tonumber(k)}
end

local info = {}
local raw = redis.call('HGETALL', meta)
for i = 1, #raw, 2 do info[raw[i]] = raw[i + 1] end
local layers = {}
for i = 1, tonumber(info['layers'] or '0') do
  layers[i] = {cap = tonumber(info['cap' .. i]), bits = tonumber(info['bits' .. i]),
               k = tonumber(info['k' .. i]), count = tonumber(info['count' .. i] or '0'),
               key = meta .. ':' .. i}
end

local function add_layer()
  local i = #layers + 1
  local spec = plan[i]
  if not spec then
    error('frontier bloom filter of segment ' .. seg .. ' is full at ' .. #layers ..
          ' layers: raise frontier.expected_items')
  end
  -- allocate the whole bit array at once: exact size, no incremental regrowth
  redis.call('SETRANGE', meta .. ':' .. i, spec[2] / 8 - 1, '\0')
  layers[i] = {cap = spec[1], bits = spec[2], k = spec[3], count = 0, key = meta .. ':' .. i}
  redis.call('HSET', meta, 'layers', i, 'cap' .. i, spec[1], 'bits' .. i, spec[2],
             'k' .. i, spec[3], 'count' .. i, 0)
end
if #layers == 0 then add_layer() end

-- bit j of a key in a layer: (h1 + j * h2) mod bits (double hashing). Offsets go to
-- Redis as '%d' strings: a number argument costs a '%.17g' conversion per call.
local fmt = string.format

local function present(h1, h2)
  for i = 1, #layers do
    local layer = layers[i]
    local all = true
    for j = 0, layer.k - 1 do
      -- GETBIT stops at the first clear bit: a new key rarely needs more than two
      if redis.call('GETBIT', layer.key, fmt('%d', (h1 + j * h2) % layer.bits)) == 0 then
        all = false
        break
      end
    end
    if all then return true end
  end
  return false
end
