local function split(blob, lengths)
  local out, pos = {}, 1
  for len in string.gmatch(lengths, '[^,]+') do
    local n = tonumber(len)
    out[#out + 1] = string.sub(blob, pos, pos + n - 1)
    pos = pos + n
  end
  return out
end
local function holds(gates, gate, id)
  local v = redis.call('HGET', gates, gate)
  return v == id or v == '+' .. id
end
local function csv(text)
  local out = {}
  for v in string.gmatch(text, '([^,]*),?') do out[#out + 1] = v end
  return out
end
