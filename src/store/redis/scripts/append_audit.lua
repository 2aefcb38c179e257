if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local id = redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[1], '*', 'records', ARGV[2])
local written = tonumber(string.match(id, '^%d+'))
local newest = tonumber(ARGV[3])
if newest > written then
  local t = redis.call('TIME')
  local at = math.min(newest, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[4]))
  if at > written then
    redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[1], string.format('%d-0', at), 'records', ARGV[2])
    redis.call('XDEL', KEYS[1], id)
  end
end
if ARGV[5] then redis.call('XDEL', KEYS[1], ARGV[5]) end
if KEYS[2] then redis.call('SET', KEYS[2], '1', 'EX', 86400) end
return 1
