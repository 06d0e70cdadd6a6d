-- name: CreateOrder :one
INSERT INTO orders (customer, amount) VALUES ($1, $2)
RETURNING id, customer, amount;

-- name: CountOrders :one
SELECT count(*) FROM orders WHERE customer = $1;
