-- KEYS: the log stream. ARGV: its bound (entries), the batch's text.
-- Appends the batch unless the stream holds the bound already; returns the length
-- before, or -1 - length when it was full and nothing was added. One script, so
-- producers side by side never take the stream past the bound.
local n = redis.call('XLEN', KEYS[1])
if n >= tonumber(ARGV[1]) then return -1 - n end
redis.call('XADD', KEYS[1], '*', 'lines', ARGV[2])
return n
