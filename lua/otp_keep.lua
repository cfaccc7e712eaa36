-- otp_keep.lua: a piece of otp_put.lua and reserve.lua, in place of their
-- KEEP line: what a new code's hash keeps of the codes it replaces.
--
-- A send keeps the live code it replaces (a sent one, burnt or not; not a
-- stand-in, whose mac is empty) ahead of the codes that one kept, at most 8,
-- newest first, in the field "kept": entries "mac,left,lo,n,exp,u" joined by
-- ';', with n and lo as otp_check.lua reads them ('' and left when the
-- code's ne is not its exp). When the new code's delivery fails,
-- otp_drop.lua puts the first one back, if it is still live; when a kept code's own
-- delivery fails, it takes it out, so that a code no SMS carried never comes
-- back. More than one is kept for sends that overlap: each may fail while
-- the others are in flight.
--
-- kept_after(h, now): the "kept" field of a code written over h, the HMGET
-- of mac, left, lo, n, exp, ne, u, kept ({} for no hash); now in ms.
local KEPT_MAX = 8
local function kept_after(h, now)
  local mac, left, exp = h[1], h[2], tonumber(h[5])
  if not mac or mac == '' or not left or not exp or exp <= now then return '' end
  local asker, lo = h[4] or '', h[3] or left
  if h[6] ~= h[5] then asker, lo = '', left end
  local entry = mac .. ',' .. left .. ',' .. lo .. ',' .. asker .. ',' .. h[5] .. ',' .. (h[7] or '0')
  local older = h[8]
  if not older or older == '' then return entry end
  local at = 0
  for _ = 1, KEPT_MAX - 1 do
    at = string.find(older, ';', at + 1, true)
    if not at then return entry .. ';' .. older end
  end
  return entry .. ';' .. string.sub(older, 1, at - 1)
end
