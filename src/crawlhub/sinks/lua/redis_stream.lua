-- KEYS: stream, index. ARGV: maxlen (0 = none), approximate (1/0), then key, hash, data
-- triples. The type checks come first: after them nothing in the loop can fail, so the
-- script is all-or-nothing although Redis does not roll scripts back.
for _, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k)['ok']
  if k == KEYS[1] and t ~= 'stream' and t ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. k .. ' is a ' .. t .. ', not a stream')
  end
  if k == KEYS[2] and t ~= 'hash' and t ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. k .. ' is a ' .. t .. ', not a hash')
  end
end
local maxlen = tonumber(ARGV[1])
local trim = ARGV[2] == '1' and '~' or '='
local inserted, updated, skipped = 0, 0, 0
for i = 3, #ARGV, 3 do
  local key, hash, data = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local old = redis.call('HGET', KEYS[2], key)
  if old == hash then
    skipped = skipped + 1
  else
    if maxlen > 0 then
      redis.call('XADD', KEYS[1], 'MAXLEN', trim, maxlen, '*',
                 'key', key, 'content_hash', hash, 'data', data)
    else
      redis.call('XADD', KEYS[1], '*', 'key', key, 'content_hash', hash, 'data', data)
    end
    redis.call('HSET', KEYS[2], key, hash)
    if old then updated = updated + 1 else inserted = inserted + 1 end
  end
end
return {inserted, updated, skipped}
