-- Shared Lua: `before(id)` is the stream id just before `id` (ids of any length, as text).
local function decrement(n)
  local digits = {string.byte(n, 1, -1)}
  local i = #digits
  while digits[i] == 48 do digits[i] = 57; i = i - 1 end
  digits[i] = digits[i] - 1
  return (string.gsub(string.char(unpack(digits)), '^0+(%d)', '%1'))
end
local function before(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if not ms then return '0-0' end
  if not string.match(seq, '^0+$') then return ms .. '-' .. decrement(seq) end
  if string.match(ms, '^0+$') then return '0-0' end
  return decrement(ms) .. '-18446744073709551615'
end
