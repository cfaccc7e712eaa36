-- The claim values that granted a console session its roles (JSON: the
-- claim's name and its values), mapped again through the role_map of the
-- day on each use: an admin taken out of role_map, or lowered, loses the
-- roles at the next request, not when the session ends. Rows written
-- before (NULL) hold no role, so their admins sign in once more.
ALTER TABLE admin_sessions ADD COLUMN grants TEXT;
