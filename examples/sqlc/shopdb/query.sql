-- name: SetStock :exec
INSERT INTO products (sku, stock) VALUES ($1, $2)
ON CONFLICT (sku) DO UPDATE SET stock = EXCLUDED.stock;

-- name: CreateOrder :exec
INSERT INTO orders (id, sku, quantity) VALUES ($1, $2, $3);

-- name: TakeStock :execrows
UPDATE products SET stock = stock - sqlc.arg(quantity)
WHERE sku = sqlc.arg(sku) AND stock >= sqlc.arg(quantity);

-- name: ListOrderIDs :many
SELECT id FROM orders ORDER BY id;
