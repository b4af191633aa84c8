-- KEYS: ledger retention unpushed gates owners   ARGV: ids, lengths, gates, lengths,
-- release '1'/'0'
local ledger, retention, unpushed, gates = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ids, gts = split(ARGV[1], ARGV[2]), split(ARGV[3], ARGV[4])
for i, id in ipairs(ids) do
  redis.call('HDEL', KEYS[5], id)
  if redis.call('ZREM', unpushed, id) == 1 then
    redis.call('HDEL', ledger, id)
    redis.call('ZREM', retention, id)
  end
  if gts[i] ~= '' and holds(gates, gts[i], id) then
    if ARGV[5] == '1' then redis.call('HSET', gates, gts[i], '') else redis.call('HDEL', gates, gts[i]) end
  end
end
return #ids
