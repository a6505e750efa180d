-- Escalation and aging record who changed an item's priority and when
-- (seed 000's escalation API). original_priority keeps the enqueue-time
-- value so "how far did aging move it" is answerable.
ALTER TABLE items
  ADD COLUMN IF NOT EXISTS original_priority   INT            NULL,
  ADD COLUMN IF NOT EXISTS priority_changed_by VARBINARY(128) NULL,
  ADD COLUMN IF NOT EXISTS priority_changed_at BIGINT         NULL;
