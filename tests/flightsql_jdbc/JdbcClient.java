// A JDBC client of `duckflock serve` through Apache Arrow's Flight SQL JDBC driver, as a BI tool uses
// it: metadata first, then a statement, a prepared statement with parameters, and a large result read
// row by row. Run as a single-file program: java -cp DRIVER_JAR JdbcClient.java URL USER PASSWORD
// Prints one line per answer ("what<TAB>value"), which the test compares with DuckDB's.

import java.math.BigDecimal;
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

public class JdbcClient {
  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    props.setProperty("user", args[1]);
    props.setProperty("password", args[2]);
    try (Connection conn = DriverManager.getConnection(args[0], props)) {
      DatabaseMetaData meta = conn.getMetaData();
      System.out.println("product\t" + meta.getDatabaseProductName() + " " + meta.isReadOnly());
      System.out.println("quote\t" + meta.getIdentifierQuoteString());
      System.out.println("keywords\t" + meta.getSQLKeywords().contains("qualify"));
      System.out.println("functions\t" + meta.getNumericFunctions().contains("sqrt"));
      System.out.println("nulls\t" + meta.nullsAreSortedAtEnd() + " " + meta.supportsColumnAliasing());
      List<String> tables = new ArrayList<>();
      try (ResultSet rs = meta.getTables(null, null, "%", null)) {
        while (rs.next()) tables.add(rs.getString("TABLE_NAME"));
      }
      System.out.println("tables\t" + String.join(",", tables));
      List<String> columns = new ArrayList<>();
      try (ResultSet rs = meta.getColumns(null, null, "nation", "%")) {
        while (rs.next()) columns.add(rs.getString("COLUMN_NAME") + " " + rs.getString("TYPE_NAME"));
      }
      System.out.println("columns\t" + String.join(",", columns));
      try (Statement st = conn.createStatement();
          ResultSet rs = st.executeQuery("SELECT count(*) AS n FROM orders")) {
        rs.next();
        System.out.println("count\t" + rs.getLong(1));
      }
      try (PreparedStatement ps =
          conn.prepareStatement("SELECT n_name FROM nation WHERE n_regionkey = ? ORDER BY n_name")) {
        for (long region : new long[] {1, 3}) {
          ps.setLong(1, region);
          List<String> names = new ArrayList<>();
          try (ResultSet rs = ps.executeQuery()) {
            while (rs.next()) names.add(rs.getString(1));
          }
          System.out.println("region " + region + "\t" + String.join(",", names));
        }
      }
      long rows = 0;
      long keys = 0;
      BigDecimal prices = BigDecimal.ZERO;
      try (Statement st = conn.createStatement();
          ResultSet rs = st.executeQuery("SELECT l_orderkey, l_extendedprice FROM lineitem")) {
        while (rs.next()) {
          rows++;
          keys += rs.getLong(1);
          prices = prices.add(rs.getBigDecimal(2));
        }
      }
      System.out.println("large\t" + rows + " " + keys + " " + prices.toPlainString());
    }
  }
}
