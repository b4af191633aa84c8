-- KEYS: ledger deadlines retention unpushed gates counters registry owners, then per
-- group (queue, outbound) the queue's ready payloads priorities stats seq.
-- ARGV: mode ('new' | 'commit'), expiry, the number of tasks, their records, then per
-- group its queue name, outbound name and delivery limit (0: none configured; one > 0
-- is stored with the queue, as its own push does). A record is seven fields, each but
-- the group a little-endian uint32 length and its bytes: uuid, entry ('' in commit
-- mode), deadline ('' none), group (a uint32, 1-based), payload, priority, gate ('').
-- 'new': record each task whose uuid is new and push it; 'commit': push each task
-- intake_begin recorded that is still unpushed, and mark it pushed.
-- Returns '1' per task pushed, '0' per task left alone.
local ledger, deadlines, retention, unpushed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local gates, counters, registry, owners = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local mode, expiry, n, blob = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local ids, entries, dls, grp, payloads, prios, gts = {}, {}, {}, {}, {}, {}, {}
local unpack_, pos = struct.unpack, 1
for i = 1, n do
  ids[i], entries[i], dls[i], grp[i], payloads[i], prios[i], gts[i], pos =
    unpack_('<I4c0I4c0I4c0I4I4c0I4c0I4c0', blob, pos)
end
local rows, out, kept, timed, fresh = {}, {}, {}, {}, {}
local nk, nt, nf = 0, 0, 0
local function flush()
  if nk > 0 then redis.call('ZADD', retention, unpack(kept, 1, nk)); nk = 0 end
  if nt > 0 then redis.call('ZADD', deadlines, unpack(timed, 1, nt)); nt = 0 end
  if nf > 0 then redis.call('HSET', ledger, unpack(fresh, 1, nf)); nf = 0 end
end
-- which uuids the ledger holds, in one call per 500 (a uuid twice: the first is new)
local known, seen = {}, {}
if mode == 'new' then
  for s = 1, n, 500 do
    local found = redis.call('HMGET', ledger, unpack(ids, s, math.min(s + 499, n)))
    for j = 1, #found do if found[j] then known[ids[s + j - 1]] = true end end
  end
end
for i = 1, n do
  local id, go = ids[i], false
  if mode == 'new' then
    go = not known[id] and not seen[id]
    if go then
      seen[id] = true
      fresh[nf + 1] = id; fresh[nf + 2] = entries[i]; nf = nf + 2
      kept[nk + 1] = expiry; kept[nk + 2] = id; nk = nk + 2
    end
  else
    redis.call('HDEL', owners, id)
    go = redis.call('ZREM', unpushed, id) == 1 and redis.call('HEXISTS', ledger, id) == 1
    if gts[i] ~= '' and holds(gates, gts[i], id) then redis.call('HDEL', gates, gts[i]) end
  end
  if go then
    if dls[i] ~= '' then timed[nt + 1] = dls[i]; timed[nt + 2] = id; nt = nt + 2 end
    if nk >= 1000 or nt >= 1000 then flush() end
    local g = grp[i]
    local r = rows[g]
    if not r then r = {{}, {}}; rows[g] = r end
    local m = #r[1] + 1
    r[1][m] = payloads[i]; r[2][m] = prios[i]
    out[i] = '1'
  else
    out[i] = '0'
  end
end
flush()
local names = {}
for g, r in pairs(rows) do
  local k, a = 8 + (g - 1) * 5, 5 + (g - 1) * 3
  push_list(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5], r[1], r[2])
  if tonumber(ARGV[a + 2]) > 0 then redis.call('HSET', KEYS[k + 4], 'max_attempts', ARGV[a + 2]) end
  names[#names + 1] = ARGV[a]
  redis.call('HINCRBY', counters, ARGV[a + 1] .. '\31total', #r[1])
end
if #names > 0 then redis.call('SADD', registry, unpack(names)) end
return table.concat(out)
