-- ARGV: payloads concatenated, their byte lengths 'l1,l2,..', their priorities 'p1,p2,..',
-- the configured delivery limit (0: none)
if tonumber(ARGV[4] or '0') > 0 then limit(ARGV[4]) end
return push_rows(ready, payloads, priorities, stats, seq, ARGV[1], ARGV[2], ARGV[3])
