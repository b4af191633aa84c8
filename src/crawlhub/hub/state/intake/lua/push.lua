-- KEYS: ledger deadlines retention unpushed gates counters registry owners, then per
-- group (queue, outbound) the queue's ready payloads priorities stats seq.
-- ARGV: mode ('new' | 'commit') now (unused) expiry, ids, lengths, entries,
-- lengths, deadlines, group per task (1-based), payloads, lengths, priorities, gates,
-- lengths, then per group its queue name, outbound name and delivery limit (0: none
-- configured; one > 0 is stored with the queue, as its own push does).
-- 'new': record each task whose uuid is new and push it; 'commit': push each task
-- intake_begin recorded that is still unpushed, and mark it pushed.
-- Returns '1' per task pushed, '0' per task left alone.
local ledger, deadlines, retention, unpushed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local gates, counters, registry, owners = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local mode, expiry = ARGV[1], ARGV[4]
local ids, entries = split(ARGV[5], ARGV[6]), split(ARGV[7], ARGV[8])
local dls, grp = csv(ARGV[9]), csv(ARGV[10])
local payloads, prios, gts = split(ARGV[11], ARGV[12]), csv(ARGV[13]), split(ARGV[14], ARGV[15])
local rows, out, kept, timed, fresh = {}, {}, {}, {}, {}
local function flush()
  if #kept > 0 then redis.call('ZADD', retention, unpack(kept)); kept = {} end
  if #timed > 0 then redis.call('ZADD', deadlines, unpack(timed)); timed = {} end
  if #fresh > 0 then redis.call('HSET', ledger, unpack(fresh)); fresh = {} end
end
-- which uuids the ledger holds, in one call per CHUNK (a uuid twice: the first is new)
local known, seen = {}, {}
if mode == 'new' then
  for s = 1, #ids, 500 do
    local chunk = {}
    for i = s, math.min(s + 499, #ids) do chunk[#chunk + 1] = ids[i] end
    local found = redis.call('HMGET', ledger, unpack(chunk))
    for j, v in ipairs(chunk) do if found[j] then known[v] = true end end
  end
end
for i, id in ipairs(ids) do
  local go = false
  if mode == 'new' then
    go = not known[id] and not seen[id]
    if go then
      seen[id] = true
      fresh[#fresh + 1] = id; fresh[#fresh + 1] = entries[i]
      kept[#kept + 1] = expiry; kept[#kept + 1] = id
    end
  else
    redis.call('HDEL', owners, id)
    go = redis.call('ZREM', unpushed, id) == 1 and redis.call('HEXISTS', ledger, id) == 1
    if gts[i] ~= '' and holds(gates, gts[i], id) then redis.call('HDEL', gates, gts[i]) end
  end
  if go then
    if dls[i] ~= '' then timed[#timed + 1] = dls[i]; timed[#timed + 1] = id end
    if #kept >= 1000 or #timed >= 1000 then flush() end
    local g = tonumber(grp[i])
    local r = rows[g]
    if not r then r = {{}, {}}; rows[g] = r end
    local n = #r[1] + 1
    r[1][n] = payloads[i]; r[2][n] = prios[i]
    out[i] = '1'
  else
    out[i] = '0'
  end
end
flush()
local names = {}
for g, r in pairs(rows) do
  local k, a = 8 + (g - 1) * 5, 16 + (g - 1) * 3
  push_list(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5], r[1], r[2])
  if tonumber(ARGV[a + 2]) > 0 then redis.call('HSET', KEYS[k + 4], 'max_attempts', ARGV[a + 2]) end
  names[#names + 1] = ARGV[a]
  redis.call('HINCRBY', counters, ARGV[a + 1] .. '\31total', #r[1])
end
if #names > 0 then redis.call('SADD', registry, unpack(names)) end
return table.concat(out)
