-- KEYS: ledger deadlines unpushed gates counters owners   ARGV: ids, lengths, deadlines
-- ('' none), gates, lengths, then counter field / increment pairs
local ledger, deadlines, unpushed, gates = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ids, dls, gts = split(ARGV[1], ARGV[2]), csv(ARGV[3]), split(ARGV[4], ARGV[5])
for i, id in ipairs(ids) do
  redis.call('HDEL', KEYS[6], id)
  if redis.call('ZREM', unpushed, id) == 1 and dls[i] ~= ''
      and redis.call('HEXISTS', ledger, id) == 1 then
    redis.call('ZADD', deadlines, dls[i], id)
  end
  if gts[i] ~= '' and holds(gates, gts[i], id) then redis.call('HDEL', gates, gts[i]) end
end
for i = 6, #ARGV, 2 do redis.call('HINCRBY', KEYS[5], ARGV[i], ARGV[i + 1]) end
return #ids
