local p, ws, we = ARGV[1], ARGV[2], ARGV[3]
local member = ws .. ' ' .. we
local removed = redis.call('HDEL', p .. ':endpoints:' .. ws, we)
redis.call('SREM', p .. ':wh:paused', member)
if redis.call('DEL', p .. ':wh:hold:' .. we) == 1 then
  rescore(p, member, p .. ':wh:due:' .. we, we)
end
return removed
