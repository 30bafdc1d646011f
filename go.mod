module github.com/hamireg/hamireg

go 1.26
