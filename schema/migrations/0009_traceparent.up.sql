-- The W3C traceparent of the enqueue that stored an item (the router's
-- publish span; NULL when the enqueue was not traced), handed to each
-- consumer so its span links back to the producer's trace. 55 ASCII
-- characters; a trailing nullable column: MariaDB adds it instantly.
ALTER TABLE items ADD COLUMN IF NOT EXISTS traceparent VARCHAR(55) CHARACTER SET ascii NULL;
