local p = ARGV[1]
local due, all = p .. ':wh:notices:due', p .. ':wh:notices'
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', ARGV[2], 'LIMIT', 0, ARGV[4])) do
  local json = redis.call('HGET', all, id)
  if json then
    redis.call('ZADD', due, ARGV[3], id)
    out[#out + 1] = json
  else
    redis.call('ZREM', due, id)
  end
end
return out
