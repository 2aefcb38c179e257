if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
local e = redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], e .. '-0', 'h', ARGV[3], 'm', ARGV[6])
if ARGV[7] then
  redis.call('XADD', KEYS[4], '*', 'id', ARGV[7], 'type', ARGV[8], 'created', ARGV[9],
    'workspace', ARGV[10], 'environment', ARGV[11], 'data', ARGV[12])
end
redis.pcall('PUBLISH', ARGV[4], e)
return e
