local n = 0
for _, raw in ipairs(redis.call('HVALS', KEYS[1])) do
  local ok, e = pcall(cjson.decode, raw)
  if ok and type(e) == 'table' and e.environment == ARGV[4] then n = n + 1 end
end
if n >= tonumber(ARGV[3]) then return -1 end
return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
