"""The duty kinds, one module each: definition, client side, leader side and consumer hook."""
