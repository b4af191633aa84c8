-- KEYS: ledger retention unpushed gates owners alive   ARGV: now owner expiry, ids, their
-- lengths, entries, their lengths, gates, their lengths. Returns one flag per task.
local ledger, retention, unpushed, gates, owners = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, owner, expiry = ARGV[1], ARGV[2], ARGV[3]
local ids, entries, gts = split(ARGV[4], ARGV[5]), split(ARGV[6], ARGV[7]), split(ARGV[8], ARGV[9])
redis.call('ZADD', KEYS[6], now, owner)
local out = {}
for i, id in ipairs(ids) do
  local gate, flag = gts[i], 'N'
  if redis.call('HEXISTS', ledger, id) == 1 then
    flag = 'A'
  elseif gate ~= '' then
    local held = redis.call('HGET', gates, gate)
    if held and string.sub(held, 1, 1) == '+' then held = string.sub(held, 2) end
    if held == '' then
      flag = 'T'
    elseif held and redis.call('ZSCORE', unpushed, held) then
      flag = 'D'
    end
  end
  if flag == 'N' or flag == 'T' then
    redis.call('HSET', ledger, id, entries[i])
    redis.call('ZADD', retention, expiry, id)
    redis.call('ZADD', unpushed, now, id)
    redis.call('HSET', owners, id, owner)
    if gate ~= '' then redis.call('HSET', gates, gate, flag == 'T' and '+' .. id or id) end
  end
  out[i] = flag
end
return table.concat(out)
