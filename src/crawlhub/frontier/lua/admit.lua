-- KEYS: meta seeds stats ready due seq segments
-- ARGV: segment plan now_ms exact channel entries duplicates lifo
--   entries: for each seed the header _ENTRY (h1 h2 ready_ms dispatched, then the
--   lengths of the priority's text, the key and the payload), then those three
--   duplicates: repeats of a key inside the batch, already settled by the client
-- Returns one character per entry: '1' admitted, '0' a duplicate; '2' a duplicate the
-- filter missed (stored, its bits not set yet); '3' admitted though the filter had it
-- (exact: a false positive). The bits of '1' and '2' are set_bits' job.
-- lifo '1': the order number in the record and member counts down from LIFO_TOP, so of
-- one priority the newest seed pops first (ZPOPMIN takes the smallest member).
local seeds, stats, ready, due = KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local seqkey, segments = KEYS[6], KEYS[7]
local now, exact, channel, blob = tonumber(ARGV[3]), ARGV[4] == '1', ARGV[5], ARGV[6]
local lifo = ARGV[8] == '1'
local LIFO_TOP = 999999999999999  -- below 2^53: exact in Lua's numbers

-- new seeds are written in multi-member calls, CHUNK at a time
local CHUNK = 1000
local ready_set, due_set = {}, {}
local function flush()
  if #ready_set > 0 then redis.call('ZADD', ready, unpack(ready_set)); ready_set = {} end
  if #due_set > 0 then redis.call('ZADD', due, unpack(due_set)); due_set = {} end
end

local out = {}
local admitted, dups, pending, dispatched, signal = 0, tonumber(ARGV[7]), 0, 0, false
local seq = tonumber(redis.call('GET', seqkey) or '0')
local pos, e = 1, 0
while pos <= #blob do
  e = e + 1
  local h1, h2, ready_ms, disp, plen, klen, vlen, at =
    struct.unpack('<I4I4dBBI4I4', blob, pos)
  local kat = at + plen
  local key = string.sub(blob, kat, kat + klen - 1)
  pos = kat + klen + vlen
  local hit = present(h1, h2)
  if hit and not exact then
    dups = dups + 1
    out[e] = '0'
  else
    -- strings built by concatenation: a number turned into text costs a sprintf
    local sq, prio = fmt('%016d', lifo and LIFO_TOP - seq - 1 or seq + 1), string.sub(blob, at, kat - 1)
    local record = sq .. '|' .. prio .. '|' .. string.sub(blob, kat + klen, pos - 1)
    -- the seed record decides: HSETNX admits a key exactly once
    if redis.call('HSETNX', seeds, key, record) == 0 then
      dups = dups + 1
      out[e] = hit and '0' or '2'
    else
      seq = seq + 1
      if disp == 1 then
        dispatched = dispatched + 1
      else
        local member = sq .. '|' .. prio .. '|' .. seg .. '|' .. key
        if ready_ms <= now then
          ready_set[#ready_set + 1] = prio == '0' and '0' or -tonumber(prio)
          ready_set[#ready_set + 1] = member
          signal = true
        else
          due_set[#due_set + 1] = ready_ms
          due_set[#due_set + 1] = member
        end
        pending = pending + 1
      end
      admitted = admitted + 1
      out[e] = hit and '3' or '1'
      if #ready_set + #due_set >= 2 * CHUNK then flush() end
    end
  end
end
flush()
if admitted > 0 then redis.call('SET', seqkey, string.format('%d', seq)) end
redis.call('HINCRBY', stats, 'admitted', admitted)
if dups > 0 then redis.call('HINCRBY', stats, 'duplicates', dups) end
if pending > 0 then redis.call('HINCRBY', stats, 'pending', pending) end
if dispatched > 0 then redis.call('HINCRBY', stats, 'dispatched', dispatched) end
redis.call('ZADD', segments, tonumber(seg), seg)
if signal then redis.call('PUBLISH', channel, '1') end
return table.concat(out)
