"""Getting data in: TPC-H generation (``tpch``) and loading of user Parquet/CSV files (``load``).

Both write into a data directory and record what they wrote in its catalog.
"""
