if redis.call('EXISTS', KEYS[2]) == 1 then return -2 end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local n = #KEYS - 6
for i = 1, n do
  if redis.call('GET', KEYS[6 + i]) ~= ARGV[8 + 3 * i] then return -1 end
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
redis.call('SET', KEYS[3], ARGV[5])
redis.call('ZADD', KEYS[4], ARGV[7], ARGV[6])
local e = redis.call('INCR', KEYS[5])
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[9], e .. '-0', 'h', ARGV[4], 'm', ARGV[10])
e = redis.call('INCR', KEYS[5])
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[9], e .. '-0', 'h', ARGV[5], 'm', ARGV[10])
for i = 1, n do
  redis.call('SET', KEYS[6 + i], ARGV[9 + 3 * i], 'KEEPTTL')
  e = redis.call('INCR', KEYS[5])
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[9], e .. '-0', 'h', ARGV[10 + 3 * i], 'm', ARGV[10])
end
redis.pcall('PUBLISH', ARGV[8], e)
return e
