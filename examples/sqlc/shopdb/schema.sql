CREATE TABLE IF NOT EXISTS products (
    sku   varchar(64) PRIMARY KEY,
    stock integer NOT NULL
);

CREATE TABLE IF NOT EXISTS orders (
    id       bigint PRIMARY KEY,
    sku      varchar(64) NOT NULL,
    quantity integer NOT NULL
);
