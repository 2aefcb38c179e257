local dropped = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], GROUP)) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info.name ~= ARGV[1] and tonumber(info.pending) == 0
     and tonumber(info.idle) > tonumber(ARGV[2]) then
    dropped = dropped + redis.call('XGROUP', 'DELCONSUMER', KEYS[1], GROUP, info.name) + 1
  end
end
return dropped
