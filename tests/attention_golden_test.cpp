#include <gtest/gtest.h>
TEST(Golden, Todo) {}
