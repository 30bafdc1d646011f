module github.com/hamireg/hamireg/hack/tools

go 1.26
